// The haiku check: haiku.txt in the workspace has three lines, each at most 12 characters,
// and one of them contains 循环.
const fs = require("fs");
const path = require("path");
const file = path.join(process.env.SUP_WORKSPACE || ".", "haiku.txt");
if (!fs.existsSync(file)) {
  console.error("haiku.txt does not exist");
  process.exit(1);
}
const lines = fs.readFileSync(file, "utf8").replace(/\n$/, "").split("\n");
const problems = [];
if (lines.length !== 3) problems.push(`expected 3 lines, found ${lines.length}`);
lines.forEach((line, i) => {
  const n = [...line].length;
  if (n > 12) problems.push(`line ${i + 1} has ${n} characters (at most 12): "${line}"`);
});
if (!lines.some((l) => l.includes("循环"))) problems.push("no line contains 循环");
if (problems.length) {
  problems.forEach((p) => console.error(p));
  process.exit(1);
}
console.log("haiku ok");
