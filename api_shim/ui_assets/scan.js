// One scan: its state, request, workers and result, read again at each change its event stream
// announces; the actions its viewer may take (abort, rescan, add workers), each asked twice (a second,
// explicit button or a small form), never by a browser dialog.
import { call, session } from "./api.js";
import { age, el, tags } from "./dom.js";
import { follow } from "./stream.js";
import { resultTable, skymapFigure } from "./skymap.js";

const web = (url) => typeof url === "string" && /^https?:\/\//i.test(url); // never a javascript: link

function fact(name, ...value) {
  return [el("dt", { text: name }), el("dd", {}, ...value)];
}

function confirmed(label, question, act) {
  const button = el("button", { type: "button", text: label });
  button.addEventListener("click", () => {
    const yes = el("button", { type: "button", class: "danger", text: question, onclick: act });
    const no = el("button", { type: "button", text: "Cancel", onclick: () => holder.replaceChildren(button) });
    holder.replaceChildren(yes, no);
    yes.focus();
  });
  const holder = el("span", { class: "action" }, button);
  return holder;
}

// Pixels done of those generated, per nside (the scanner's `tallies.nsides`), as bars.
function progressBars(progress) {
  const nsides = Object.entries(progress?.tallies?.nsides || {}).sort(([a], [b]) => Number(a) - Number(b));
  if (!nsides.length) return el("p", { text: "No pixel reconstructed yet." });
  return el("div", { class: "bars" }, nsides.map(([nside, tally]) => {
    const done = Number(tally?.pixels?.done) || 0;
    const generated = Number(tally?.pixels?.generated) || 0;
    const label = `nside ${nside}`;
    return el("div", { class: "bar" },
      el("span", { text: label }),
      el("progress", { max: Math.max(generated, 1), value: Math.min(done, generated), "aria-label": label }),
      el("span", { class: "number", text: `${done} / ${generated}` }));
  }));
}

// When things happened: what the scan records (created, its scanner's start and end) and each state
// this page saw it enter, in time order.
function timeline(manifest, seen) {
  const when = (seconds) => new Date(seconds * 1000).toLocaleString();
  const moments = [[manifest.timestamp, "created"]];
  if (manifest.progress?.start) moments.push([manifest.progress.start, "scanner started"]);
  if (manifest.progress?.end) moments.push([manifest.progress.end, "scanner ended"]);
  let first = true;
  for (const [state, at] of seen) {
    moments.push([at, first ? `${state} (as this page opened)` : `→ ${state}`]);
    first = false;
  }
  moments.sort(([a], [b]) => a - b);
  return el("ol", { class: "timeline" }, moments.map(([at, what]) => el("li", {}, el("time", { text: when(at) }), ` ${what}`)));
}

function taskforceTable(taskforces) {
  if (!taskforces.length) return el("p", { text: "No taskforce yet." });
  const cell = (value) => el("td", { text: value ?? "" });
  return el("table", { class: "taskforces" },
    el("thead", {}, el("tr", {}, ["Cluster", "Workers", "Phase"].map((name) => el("th", { scope: "col", text: name })))),
    el("tbody", {}, taskforces.map((t) => el("tr", {}, cell(t.cluster_location), cell(t.n_workers), cell(t.phase)))));
}

// Add workers: a small form (how many, where) whose submit button is the confirmation.
function workersForm(add) {
  const open = el("button", { type: "button", text: "Add workers" });
  const holder = el("span", { class: "action" }, open);
  open.addEventListener("click", () => {
    const n = el("input", { name: "n_workers", type: "number", min: "1", step: "1", value: "10", required: true, "aria-label": "Number of workers" });
    const where = el("input", { name: "cluster_location", value: "osg", required: true, size: 10, "aria-label": "Cluster" });
    const form = el(
      "form",
      { class: "inline", "aria-label": "Add workers" },
      n,
      " on ",
      where,
      " ",
      el("button", { type: "submit", class: "danger", text: "Yes, add workers" }),
      el("button", { type: "button", text: "Cancel", onclick: () => holder.replaceChildren(open) }),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      add({ n_workers: Number(n.value), cluster_location: where.value.trim() }).then((done) => done && holder.replaceChildren(open));
    });
    holder.replaceChildren(form);
    n.focus();
  });
  return holder;
}

export async function scanPage(main, notice, id) {
  const path = `/scan/${encodeURIComponent(id)}`;
  const facts = el("dl", { class: "facts" });
  const actions = el("p", { class: "actions" });
  const result = el("section", { class: "result", "aria-label": "Result" });
  const progress = el("section", { "aria-label": "Progress" });
  const history = el("section", { "aria-label": "State over time" });
  const workers = el("section", { "aria-label": "Taskforces" });
  main.replaceChildren(el("h1", {}, "Scan ", el("code", { text: id })), actions, facts, progress, history, workers, result);
  const seen = new Map(); // state -> when this page first saw it

  async function refresh() {
    const [status, scan, request, taskforces] = await Promise.all([
      call("GET", `${path}/status`),
      call("GET", `${path}?include_deleted=true`),
      call("GET", `/scan-request/${encodeURIComponent(id)}`),
      call("GET", `${path}/wms/taskforces`).then((t) => t.taskforces, () => []), // none while the WMS cannot say
    ]);
    const manifest = scan.manifest;
    const meta = manifest.event_metadata || {};
    const logs = status.scanner_server_logs;
    const logUrl = typeof logs === "string" ? logs : logs?.url;
    facts.replaceChildren(
      ...fact("State", el("span", { class: "state", text: status.scan_state })),
      ...fact("Deleted", status.is_deleted ? "yes" : "no"),
      ...fact("Progress", manifest.progress?.summary || "none yet"),
      ...fact("Run / event", meta.run_id === undefined ? "unknown yet" : `${meta.run_id} / ${meta.event_id}`),
      ...fact("Workers", `${status.wms_workforce?.n_running ?? 0} running`, status.wms_deactivated ? ` (WMS: ${status.wms_deactivated})` : ""),
      ...fact("Request", `${request.reco_algo}, nsides ${Object.entries(request.nsides).map(([n, p]) => `${n}:${p}`).join(" ")}, tag ${request.docker_tag}`),
      ...fact("Priority", manifest.priority ?? ""),
      ...fact("Created", `${age(manifest.timestamp)} ago`),
      ...fact("Classifiers", tags(manifest.classifiers)),
      ...fact("Logs", web(logUrl) ? el("a", { href: logUrl, rel: "noopener noreferrer", text: "scanner server logs" }) : "none"),
    );
    if (!seen.has(status.scan_state)) seen.set(status.scan_state, Date.now() / 1000);
    progress.replaceChildren(el("h2", { text: "Progress per nside" }), progressBars(manifest.progress));
    history.replaceChildren(el("h2", { text: "State over time" }), timeline(manifest, seen));
    workers.replaceChildren(el("h2", { text: "Taskforces" }), taskforceTable(taskforces));
    const found = scan.result?.scan_result || {};
    result.replaceChildren(
      el("h2", { text: scan.result?.is_final ? "Final result" : Object.keys(found).length ? "Partial result" : "No result yet" }),
      resultTable(found),
      skymapFigure(result, scan.result),
    );
    showActions(Boolean(status.is_deleted || status.scan_complete));
  }

  let shown = null; // whether the actions shown are an ended scan's: redrawn only when that changes
  function showActions(ended) {
    if (ended === shown) return; // an open confirmation or form survives the page's refreshes
    shown = ended;
    actions.replaceChildren(
      !ended && session.may("abort") ? confirmed("Abort", "Yes, abort this scan", () => act("DELETE", path, {})) : "",
      session.may("rescan") ? confirmed("Rescan", "Yes, start a rescan", () => act("POST", `${path}/actions/rescan`, {})) : "",
      !ended && session.may("add_workers") ? workersForm((body) => act("POST", `${path}/actions/add-workers`, body)) : "",
    );
  }

  async function act(method, where, body) {
    try {
      const answer = await call(method, where, body);
      const next = answer?.manifest?.scan_id ?? answer?.scan_id;
      if (method === "POST" && next && next !== id) location.hash = `#/scan/${encodeURIComponent(next)}`;
      else await refresh();
      notice.clear();
      return true;
    } catch (failure) {
      notice.failure(failure);
      return false;
    }
  }

  // One read at a time: changes announced while one runs are read by one more after it.
  let reading = null;
  let again = false;
  function changed() {
    if (reading) {
      again = true;
      return;
    }
    reading = refresh()
      .catch(notice.failure)
      .finally(() => {
        reading = null;
        if (again) {
          again = false;
          changed();
        }
      });
  }

  await refresh();
  return follow(`${path}/events`, changed, notice.connection);
}
