// The scans page: a find over live and archived scans, newest first, a page of rows at a time, each
// visible row's state read from its status.
import { call } from "./api.js";
import { age, el, tags } from "./dom.js";

const PAGE_ROWS = 50;
const FIELDS = ["scan_id", "timestamp", "is_deleted", "priority", "classifiers", "event_metadata", "progress"];

function filterOf(form) {
  const filter = {};
  const number = (name) => form.elements[name].value.trim();
  if (number("run_id")) filter["event_metadata.run_id"] = Number(number("run_id"));
  if (number("event_id")) filter["event_metadata.event_id"] = Number(number("event_id"));
  const classifier = form.elements.classifier.value.trim();
  if (classifier) {
    const [key, ...rest] = classifier.split("=");
    const text = rest.join("=");
    let value = text;
    try {
      value = JSON.parse(text); // numbers and booleans as themselves
    } catch {
      // a string
    }
    filter[`classifiers.${key.trim()}`] = value;
  }
  return filter;
}

function row(manifest) {
  const meta = manifest.event_metadata || {};
  const state = el("td", { class: "state", text: "…" });
  const tr = el(
    "tr",
    { "data-scan-id": manifest.scan_id },
    el("td", {}, el("a", { href: `#/scan/${encodeURIComponent(manifest.scan_id)}`, text: manifest.scan_id })),
    el("td", { text: meta.run_id === undefined ? "" : `${meta.run_id} / ${meta.event_id}` }),
    state,
    el("td", { text: manifest.progress?.summary || "" }),
    el("td", {}, tags(manifest.classifiers)),
    el("td", { class: "number", text: manifest.priority ?? "" }),
    el("td", { text: age(manifest.timestamp) }),
  );
  return { tr, state };
}

export async function scansPage(main, notice) {
  const form = el(
    "form",
    { class: "filters", "aria-label": "Find scans" },
    el("label", {}, "Run ", el("input", { name: "run_id", inputmode: "numeric", size: 8 })),
    el("label", {}, "Event ", el("input", { name: "event_id", inputmode: "numeric", size: 8 })),
    el("label", {}, "Classifier ", el("input", { name: "classifier", placeholder: "key=value", size: 16 })),
    el("label", {}, el("input", { name: "deleted", type: "checkbox" }), " deleted too"),
    el("button", { type: "submit", text: "Find" }),
  );
  const body = el("tbody");
  const table = el(
    "table",
    { class: "scans" },
    el("thead", {}, el("tr", {}, ["Scan", "Run / event", "State", "Progress", "Classifiers", "Priority", "Age"].map(
      (name) => el("th", { scope: "col", text: name }),
    ))),
    body,
  );
  const pager = el("p", { class: "pager" });
  main.replaceChildren(el("h1", { text: "Scans" }), form, table, pager);
  let found = [];
  let first = 0;

  async function show() {
    const rows = found.slice(first, first + PAGE_ROWS).map(row);
    body.replaceChildren(...rows.map((r) => r.tr));
    const last = Math.min(first + PAGE_ROWS, found.length);
    pager.replaceChildren(
      el("button", { type: "button", disabled: first === 0, text: "Newer", onclick: () => { first -= PAGE_ROWS; show(); } }),
      ` ${found.length ? first + 1 : 0}–${last} of ${found.length} `,
      el("button", { type: "button", disabled: last >= found.length, text: "Older", onclick: () => { first += PAGE_ROWS; show(); } }),
    );
    await Promise.all(rows.map(async (r) => {
      const id = r.tr.dataset.scanId;
      try {
        r.state.textContent = (await call("GET", `/scan/${encodeURIComponent(id)}/status`)).scan_state;
      } catch (failure) {
        r.state.textContent = failure.status === 404 ? "gone" : "?";
      }
    }));
  }

  async function find() {
    const answer = await call("POST", "/scans/find", {
      filter: filterOf(form),
      include_deleted: form.elements.deleted.checked,
      manifest_projection: FIELDS,
    });
    found = answer.manifests.reverse(); // newest first: scan ids begin with their creation time
    first = 0;
    notice.clear();
    await show();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    find().catch(notice.failure);
  });
  await find();
  const timer = setInterval(() => {
    if (document.visibilityState === "visible") find().catch(notice.failure);
  }, 5000);
  return () => clearInterval(timer);
}
