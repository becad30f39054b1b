// The dashboard: a login at the OIDC issuer (login.js) or a login link's one-time code exchanged for
// this tab's token, who that token is, then the page the location's hash names, live while it is shown
// (each page returns how to leave it).
import { ApiFailure, exchange, session, token } from "./api.js";
import { backlogPage } from "./backlog.js";
import { el } from "./dom.js";
import { launchPage } from "./launch.js";
import { finishLogin, forgetLogin, keepFresh, logIn, loginConfig } from "./login.js";
import { scanPage } from "./scan.js";
import { scansPage } from "./scans.js";

const PAGES = { scans: scansPage, backlog: backlogPage, launch: launchPage, scan: scanPage };
const main = document.getElementById("page");
const noticeLine = document.getElementById("notice");
let leave = () => {};
let login = null; // how people log in here (GET /ui/config)

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

// `atIssuer`: the person chose to log out, so their session at the issuer ends too (its page asks).
function logOut(text, atIssuer = false) {
  leave();
  leave = () => {};
  const issuerLogout = forgetLogin(login?.oidc);
  token.clear();
  session.clear();
  for (const id of ["logout", "launch-link", "who"]) document.getElementById(id).hidden = true;
  if (atIssuer && issuerLogout) return location.assign(issuerLogout);
  const oidc = login?.oidc;
  const hint = oidc
    ? "Log in with your account at your organisation's identity provider."
    : "Open the login link `make up` printed (it works once, for a few minutes).";
  main.replaceChildren(
    el("h1", { text: "Log in" }),
    el("p", { text: text || hint }),
    oidc ? el("button", { type: "button", class: "login", text: "Log in", onclick: () => startLogin(oidc) }) : "",
  );
}

// The browser computes the PKCE challenge with crypto.subtle, which it offers on https (and loopback) only.
function startLogin(oidc) {
  logIn(oidc).catch((error) =>
    notice.show(`The login cannot start here (${error.message}): open the dashboard over https.`),
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
  Object.assign(document.getElementById("who"), { textContent: session.name(), hidden: false });
  const [name, id] = location.hash.replace(/^#\/?/, "").split("/");
  const page = PAGES[name] || scansPage;
  try {
    leave = (await page(main, notice, decodeURIComponent(id || ""))) || (() => {});
  } catch (error) {
    notice.failure(error);
  }
}

async function start() {
  try {
    login = await loginConfig();
  } catch (error) {
    notice.failure(error); // the issuer cannot be reached: said, and login links still work
  }
  if (login?.oidc) {
    try {
      await finishLogin(login.oidc);
    } catch (error) {
      notice.show(`The login failed: ${error.message}`);
    }
    keepFresh(login.oidc, (text) => logOut(text));
  }
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (code) {
    history.replaceState(null, "", `${location.pathname}#/scans`); // the code leaves the address bar
    try {
      await exchange(code);
    } catch (error) {
      notice.show(error instanceof ApiFailure ? error.message : "The login failed.");
    }
  }
  document.getElementById("logout").addEventListener("click", () => logOut("Logged out.", true));
  window.addEventListener("hashchange", route);
  await route();
}

start();
