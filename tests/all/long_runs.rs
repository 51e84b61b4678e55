//! Long runs through the binary: compaction against servers with small windows, partial
//! answers kept on Ctrl-C, the default output limit.
