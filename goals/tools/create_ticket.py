"""create_ticket: reads {"title", "priority", "body", "articles"} on stdin and writes the
ticket as tickets/TICKET-N.json in the workspace; prints its id."""
import json
import pathlib
import sys

ticket = json.load(sys.stdin)
folder = pathlib.Path("tickets")
folder.mkdir(exist_ok=True)
n = len(list(folder.glob("TICKET-*.json"))) + 1
ticket["id"] = f"TICKET-{n}"
(folder / f"{ticket['id']}.json").write_text(json.dumps(ticket, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
print(json.dumps({"id": ticket["id"], "status": "open"}))
