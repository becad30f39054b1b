// The dashboard: a login link's one-time code exchanged for this tab's token, who that token is, then
// the page the location's hash names, live while it is shown (each page returns how to leave it).
import { ApiFailure, exchange, session, token } from "./api.js";
import { backlogPage } from "./backlog.js";
import { el } from "./dom.js";
import { launchPage } from "./launch.js";
import { scanPage } from "./scan.js";
import { scansPage } from "./scans.js";

const PAGES = { scans: scansPage, backlog: backlogPage, launch: launchPage, scan: scanPage };
const main = document.getElementById("page");
const noticeLine = document.getElementById("notice");
let leave = () => {};

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
      logOut("Your session ended: log in again.");
      return;
    }
    notice.show(error instanceof ApiFailure ? error.message : `The service cannot be reached (${error.message}).`);
  },
  // A page's stream: its loss shown until it is back.
  connection: {
    up: () => notice.clear(),
    lost: () => notice.show("The connection to the service was lost: reconnecting…"),
    failed: (error) => notice.failure(error),
  },
};

function logOut(text) {
  leave();
  leave = () => {};
  token.clear();
  session.clear();
  document.getElementById("logout").hidden = true;
  document.getElementById("launch-link").hidden = true;
  main.replaceChildren(
    el("h1", { text: "Log in" }),
    el("p", { text: text || "Open the login link `make up` printed (it works once, for a few minutes)." }),
  );
}

async function route() {
  leave();
  leave = () => {};
  if (!token.get()) return logOut();
  try {
    if (!session.name()) await session.load();
  } catch (error) {
    if (error instanceof ApiFailure && error.status === 403) return logOut(error.message);
    return notice.failure(error);
  }
  document.getElementById("logout").hidden = false;
  document.getElementById("launch-link").hidden = !session.may("launch");
  const [name, id] = location.hash.replace(/^#\/?/, "").split("/");
  const page = PAGES[name] || scansPage;
  try {
    leave = (await page(main, notice, decodeURIComponent(id || ""))) || (() => {});
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
  document.getElementById("logout").addEventListener("click", () => logOut("Logged out."));
  window.addEventListener("hashchange", route);
  await route();
}

start();
