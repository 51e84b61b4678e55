// The weather check: the model's final answer names Shenzhen (28°C beats Shanghai's 20°C).
const fs = require("fs");
const answer = fs.readFileSync(process.env.SUP_ANSWER, "utf8");
if (!/shenzhen/i.test(answer)) {
  console.error(`the answer does not name Shenzhen: ${JSON.stringify(answer)}`);
  process.exit(1);
}
if (/shanghai is hotter/i.test(answer)) {
  console.error("the answer says Shanghai is hotter");
  process.exit(1);
}
console.log("answer ok");
