// sup web console: the only script. A running run's transcript grows as events are written
// (server-sent events carry server-rendered, escaped HTML); when the run ends the page reloads
// to show the outcome. Every page works without it.
"use strict";
(function () {
  const t = document.getElementById("transcript");
  if (!t || t.dataset.live !== "1") return;
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
})();
