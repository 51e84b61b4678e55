"""search_knowledge_base: reads {"query": ...} on stdin; prints the articles of goals/kb that
share words with the query, best first, as JSON."""
import json
import pathlib
import re
import sys

KB = pathlib.Path(__file__).resolve().parent.parent / "kb"
words = {w for w in re.findall(r"[a-z0-9]+", json.load(sys.stdin)["query"].lower()) if len(w) > 2}
hits = []
for article in sorted(KB.glob("*.md")):
    text = article.read_text(encoding="utf-8")
    score = len(words & set(re.findall(r"[a-z0-9]+", text.lower())))
    if score:
        hits.append({"id": article.stem, "title": text.splitlines()[0].lstrip("# "), "score": score, "text": text})
hits.sort(key=lambda h: -h["score"])
print(json.dumps({"results": hits[:3]}, ensure_ascii=False))
