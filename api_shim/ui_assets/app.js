// The dashboard: a login link's one-time code exchanged for this tab's token, then the page the
// location's hash names, refreshed while it is shown.
import { ApiFailure, exchange, token } from "./api.js";
import { backlogPage } from "./backlog.js";
import { el } from "./dom.js";
import { launchPage } from "./launch.js";
import { scanPage } from "./scan.js";
import { scansPage } from "./scans.js";

const REFRESH_MS = 5000;
const PAGES = { scans: scansPage, backlog: backlogPage, launch: launchPage, scan: scanPage };
const main = document.getElementById("page");
const noticeLine = document.getElementById("notice");
let refresh = null;

const notice = {
  show(text) {
    noticeLine.textContent = text;
    noticeLine.hidden = false;
  },
  clear() {
    noticeLine.hidden = true;
    noticeLine.textContent = "";
  },
  failure(error) {
    if (error instanceof ApiFailure && error.status === 401) {
      token.clear();
      loggedOut("Your session ended: open a new login link.");
      return;
    }
    notice.show(error instanceof ApiFailure ? error.message : `The service cannot be reached (${error.message}).`);
  },
};

function loggedOut(text) {
  document.getElementById("logout").hidden = true;
  main.replaceChildren(
    el("h1", { text: "Log in" }),
    el("p", { text: text || "Open the login link `make up` printed (it works once, for a few minutes)." }),
  );
}

async function route() {
  refresh = null;
  if (!token.get()) return loggedOut();
  document.getElementById("logout").hidden = false;
  const [name, id] = location.hash.replace(/^#\/?/, "").split("/");
  const page = PAGES[name] || scansPage;
  try {
    refresh = (await page(main, notice, decodeURIComponent(id || ""))) || null;
  } catch (error) {
    notice.failure(error);
  }
}

async function start() {
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (code) {
    history.replaceState(null, "", `${location.pathname}#/scans`); // the code leaves the address bar
    try {
      await exchange(code);
    } catch (error) {
      notice.show(error instanceof ApiFailure ? error.message : "The login failed.");
    }
  }
  document.getElementById("logout").addEventListener("click", () => {
    token.clear();
    loggedOut("Logged out.");
  });
  window.addEventListener("hashchange", route);
  setInterval(() => {
    if (refresh && document.visibilityState === "visible") refresh().catch(notice.failure);
  }, REFRESH_MS);
  await route();
}

start();
