// The scans page: the service's table of scans (GET /scans), newest first, a page at a time, filtered
// by the form; one stream (GET /scans/events) keeps the shown rows live and tells of new scans.
import { call } from "./api.js";
import { age, el, tags } from "./dom.js";
import { follow } from "./stream.js";

const PAGE_ROWS = 50;
const NEW_SCANS_EVERY_MS = 2000; // the first page is read again at most this often while scans arrive
const STATES = ["", "PENDING", "IN_PROGRESS", "SCAN_HAS_FINAL_RESULT", "ABORTED", "FINISHED"];
const COLUMNS = ["Scan", "Run / event", "State", "Progress", "Classifiers", "Priority", "Age"];

const seconds = (text) => (text ? String(Date.parse(text) / 1000) : "");

function query(form, before) {
  const v = (name) => form.elements[name].value.trim();
  const params = new URLSearchParams({ limit: String(PAGE_ROWS) });
  for (const name of ["run_id", "event_id", "classifier", "state"]) if (v(name)) params.set(name, v(name));
  if (v("since")) params.set("since", seconds(v("since")));
  if (v("until")) params.set("until", seconds(v("until")));
  if (form.elements.archived.checked) params.set("archived", "true");
  if (form.elements.deleted.checked) params.set("deleted", "true");
  if (before) params.set("before", before);
  return params;
}

function cells(row) {
  const meta = row.event_metadata || {};
  return [
    el("td", {}, el("a", { href: `#/scan/${encodeURIComponent(row.scan_id)}`, text: row.scan_id })),
    el("td", { text: meta.run_id === undefined ? "" : `${meta.run_id} / ${meta.event_id}` }),
    el("td", { class: "state", text: row.scan_state + (row.is_deleted ? " (deleted)" : "") }),
    el("td", { text: row.progress?.summary || "" }),
    el("td", {}, tags(row.classifiers)),
    el("td", { class: "number", text: row.priority }),
    el("td", { text: age(row.timestamp) }),
  ];
}

export async function scansPage(main, notice) {
  const form = el(
    "form",
    { class: "filters", "aria-label": "Find scans" },
    el("label", {}, "Run ", el("input", { name: "run_id", inputmode: "numeric", size: 8 })),
    el("label", {}, "Event ", el("input", { name: "event_id", inputmode: "numeric", size: 8 })),
    el("label", {}, "Classifier ", el("input", { name: "classifier", placeholder: "key=value", size: 16 })),
    el("label", {}, "State ", el("select", { name: "state" }, STATES.map((s) => el("option", { value: s, text: s || "any" })))),
    el("label", {}, "From ", el("input", { name: "since", type: "datetime-local" })),
    el("label", {}, "to ", el("input", { name: "until", type: "datetime-local" })),
    el("label", {}, el("input", { name: "archived", type: "checkbox" }), " archived too"),
    el("label", {}, el("input", { name: "deleted", type: "checkbox" }), " deleted too"),
    el("button", { type: "submit", text: "Find" }),
  );
  const body = el("tbody");
  const table = el(
    "table",
    { class: "scans" },
    el("thead", {}, el("tr", {}, COLUMNS.map((name) => el("th", { scope: "col", text: name })))),
    body,
  );
  const pager = el("p", { class: "pager" });
  main.replaceChildren(el("h1", { text: "Scans" }), form, table, pager);

  const cursors = []; // each shown page's `before` (none for the first)
  let next = null;
  let stop = () => {};
  let followed = "";
  let reread = null;

  function show(rows) {
    body.replaceChildren(...rows.map((row) => el("tr", { "data-scan-id": row.scan_id }, cells(row))));
    pager.replaceChildren(
      el("button", { type: "button", disabled: !cursors.length, text: "Newer", onclick: () => newer().catch(notice.failure) }),
      el("button", { type: "button", disabled: !next, text: "Older", onclick: () => turn(next).catch(notice.failure) }),
    );
    const ids = rows.map((row) => row.scan_id);
    if (ids.join() !== followed) {
      followed = ids.join();
      stop();
      const path = `/scans/events?${new URLSearchParams(ids.map((id) => ["scan_id", id]))}`;
      stop = follow(path, changed, notice.connection);
    }
  }

  function changed(kind, data) {
    if (kind === "scan") {
      const tr = body.querySelector(`tr[data-scan-id="${CSS.escape(data.scan_id)}"]`);
      if (tr) tr.replaceChildren(...cells(data));
    } else if (kind === "gone") {
      const state = body.querySelector(`tr[data-scan-id="${CSS.escape(data.scan_id)}"] td.state`);
      if (state) state.textContent = "archived";
    } else if (kind === "new" && !cursors.length && !reread) {
      reread = setTimeout(() => {
        reread = null;
        turn(null).catch(notice.failure);
      }, NEW_SCANS_EVERY_MS);
    }
  }

  async function turn(before) {
    const found = await call("GET", `/scans?${query(form, before)}`);
    if (before) cursors.push(before);
    next = found.next;
    show(found.scans);
  }

  function newer() {
    cursors.pop(); // this page's
    return turn(cursors.pop() ?? null); // the one before it (pushed again as it is shown)
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    cursors.length = 0;
    turn(null).then(() => notice.clear(), notice.failure);
  });
  await turn(null);
  performance.mark("skyscan:scans:rows"); // the first rows shown (make bench reads it)
  return () => {
    clearTimeout(reread);
    stop();
  };
}
