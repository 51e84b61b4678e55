//! The enums whose values are words (stop reasons, statuses, kinds): each declared once with
//! its text, which `as_str`, `parse`, `Display`, `FromStr` and serde all go by. A leaf: the
//! trace's words and the store's use it alike.

/// Declares an enum of words: `as_str`, `parse`, `ALL`, `Display`, `FromStr` and serde. There is no
/// equality with a `&str`: a comparison names a variant, so a misspelt word does not compile.
macro_rules! words {
    ($(#[$meta:meta])* pub enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                $name::parse(s).ok_or_else(|| {
                    let all: Vec<&str> = $name::ALL.iter().map(|v| v.as_str()).collect();
                    format!("`{s}` is not one of: {}", all.join(", "))
                })
            }
        }

    };
}

pub(crate) use words;
