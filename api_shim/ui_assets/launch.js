// A new scan (`POST /scan`), each refusal shown at the field it names.
import { call } from "./api.js";
import { el } from "./dom.js";

const FIELDS = [
  ["docker_tag", "Docker tag", "latest"],
  ["reco_algo", "Reconstruction", "millipede_wilks"],
  ["nsides", "Nsides (nside:pixel extension ...)", "8:0 64:12"],
  ["real_or_simulated_event", "Real or simulated", "real"],
  ["max_pixel_reco_time", "Max pixel reco time (s)", "600"],
  ["request_clusters", "Clusters (name=workers ...)", "osg=2"],
  ["priority", "Priority", "0"],
  ["classifiers", "Classifiers (key=value ...)", ""],
];

const pairs = (text, sep) =>
  Object.fromEntries(text.split(/\s+/).filter(Boolean).map((item) => {
    const [key, ...rest] = item.split(sep);
    const value = rest.join(sep);
    return [key, /^-?\d+(\.\d+)?$/.test(value) ? Number(value) : value];
  }));

function body(form) {
  const v = (name) => form.elements[name].value.trim();
  return {
    docker_tag: v("docker_tag"),
    reco_algo: v("reco_algo"),
    nsides: pairs(v("nsides"), ":"),
    real_or_simulated_event: v("real_or_simulated_event"),
    max_pixel_reco_time: Number(v("max_pixel_reco_time")),
    request_clusters: pairs(v("request_clusters"), "="),
    priority: Number(v("priority")),
    classifiers: pairs(v("classifiers"), "="),
    event_live_json: (() => {
      try {
        return JSON.parse(v("event"));
      } catch {
        return v("event"); // the service says what is wrong with it, at its field
      }
    })(),
  };
}

export async function launchPage(main, notice) {
  const inputs = FIELDS.map(([name, label, value]) =>
    el("p", { class: "field" }, el("label", { for: `f-${name}`, text: label }), el("input", { id: `f-${name}`, name, value }),
      el("span", { class: "refusal", id: `r-${name}`, role: "alert" })));
  const form = el("form", { class: "launch", "aria-label": "Launch a scan" },
    ...inputs,
    el("p", { class: "field" }, el("label", { for: "f-event", text: "Event (JSON)" }),
      el("textarea", { id: "f-event", name: "event", rows: 6, cols: 60 }), el("span", { class: "refusal", id: "r-event_live_json", role: "alert" })),
    el("button", { type: "submit", text: "Launch" }));
  main.replaceChildren(el("h1", { text: "Launch a scan" }), form);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    for (const refusal of form.querySelectorAll(".refusal")) refusal.textContent = "";
    try {
      const manifest = await call("POST", "/scan", body(form));
      location.hash = `#/scan/${encodeURIComponent(manifest.scan_id)}`;
    } catch (failure) {
      const field = /^'([a-z_]+)/.exec(failure.reason || "")?.[1];
      const at = field && form.querySelector(`#r-${field}`);
      if (at) at.textContent = failure.reason;
      else notice.failure(failure);
    }
  });
}
