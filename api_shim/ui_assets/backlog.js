// The backlog: waiting scans in admission order, with their priority, read again every few seconds
// while shown (a small answer: the backlog is what waits, not every scan).
import { call } from "./api.js";
import { age, el } from "./dom.js";

const REFRESH_MS = 5000;

export async function backlogPage(main, notice) {
  const body = el("tbody");
  main.replaceChildren(
    el("h1", { text: "Backlog" }),
    el("table", { class: "backlog" },
      el("thead", {}, el("tr", {}, ["#", "Scan", "Priority", "Waiting"].map((name) => el("th", { scope: "col", text: name })))),
      body),
  );
  async function refresh() {
    const { entries } = await call("GET", "/scans/backlog");
    body.replaceChildren(...entries.map((entry, i) => el("tr", { "data-scan-id": entry.scan_id },
      el("td", { class: "number", text: i + 1 }),
      el("td", {}, el("a", { href: `#/scan/${encodeURIComponent(entry.scan_id)}`, text: entry.scan_id })),
      el("td", { class: "number", text: entry.priority }),
      el("td", { text: age(entry.timestamp) }),
    )));
    notice.clear();
  }
  await refresh();
  const timer = setInterval(() => {
    if (document.visibilityState === "visible") refresh().catch(notice.failure);
  }, REFRESH_MS);
  return () => clearInterval(timer);
}
