"""The ticket check: the newest ticket is medium priority, cites a knowledge-base article that
exists, and its body says what to do about the missing reset email."""
import json
import os
import pathlib
import sys

# The check runs from a copy frozen in the run folder; SUP_CHECK_DIR is its original folder.
KB = pathlib.Path(os.environ.get("SUP_CHECK_DIR", pathlib.Path(__file__).resolve().parent)).parent / "kb"
tickets = sorted(pathlib.Path("tickets").glob("TICKET-*.json"), key=lambda p: int(p.stem.split("-")[1]))
problems = []
if not tickets:
    problems.append("no ticket in tickets/: create one with create_ticket")
else:
    t = json.loads(tickets[-1].read_text(encoding="utf-8"))
    if t.get("priority") != "medium":
        problems.append(f"priority is {t.get('priority')!r}, expected 'medium'")
    cited = [a for a in t.get("articles", []) if (KB / f"{a}.md").exists()]
    if not cited:
        problems.append(f"the ticket cites no existing article: {t.get('articles')}")
    if "KB-101" not in cited:
        problems.append("the ticket does not cite KB-101, the article about reset emails")
    body = t.get("body", "").lower()
    if "spam" not in body and "allow" not in body:
        problems.append("the body does not say what to do (spam folder, allow list)")
for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
