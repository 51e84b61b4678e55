// sup web console: the only script. A running run's transcript grows as events are written
// (server-sent events carry server-rendered, escaped HTML); when the run ends the page reloads
// to show the outcome. The lists (runs, approvals, goals) refresh themselves every few seconds
// from the same server-rendered page, unless a person is typing in one of their fields.
// Every page works without it.
"use strict";
(function () {
  const t = document.getElementById("transcript");
  if (t && t.dataset.live === "1") {
    const es = new EventSource(t.dataset.src);
    es.addEventListener("line", (e) => {
      const empty = t.querySelector(".empty");
      if (empty) empty.remove();
      const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      t.insertAdjacentHTML("beforeend", e.data);
      if (atBottom) window.scrollTo(0, document.body.scrollHeight);
    });
    es.addEventListener("end", () => {
      es.close();
      window.location.reload();
    });
  }
  if (!["/runs", "/approvals", "/goals"].includes(window.location.pathname)) return;
  const main = document.querySelector("main");
  if (!main) return;
  const busy = () => {
    const a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "TEXTAREA") && a.value !== "";
  };
  setInterval(async () => {
    if (document.hidden || busy()) return;
    try {
      const r = await fetch(window.location.href, { headers: { "x-sup-refresh": "1" } });
      if (!r.ok) return;
      const fresh = new DOMParser().parseFromString(await r.text(), "text/html").querySelector("main");
      if (fresh && fresh.innerHTML !== main.innerHTML) {
        main.innerHTML = fresh.innerHTML;
        main.dataset.refreshed = String(Number(main.dataset.refreshed || 0) + 1);
      }
    } catch (_) {
      // The console went away or the network hiccupped: try again at the next tick.
    }
  }, 3000);
})();
