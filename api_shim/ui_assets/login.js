// Logging in as people log in: the OpenID Connect authorization-code flow with PKCE (S256) against the
// issuer `GET /ui/config` names, run by this page as a public client (no secret). The state and the
// code verifier wait in session storage for the round trip only; the code comes back in the fragment
// (or, where the issuer cannot, in the query, removed from the address bar at once) and is exchanged
// at the token endpoint by the page. The access token is this tab's (api.js: session storage), renewed
// with the refresh token before it expires; nothing of it enters a URL, a log or local storage.
import { call, token } from "./api.js";

const FLOW_KEY = "skyscan.oidc.flow"; // {state, verifier}: one round trip to the issuer
const REFRESH_KEY = "skyscan.oidc.refresh"; // {refresh_token, expires_at}
const RETRY_MS = 10_000; // a renewal the issuer did not answer is tried again this much later

let config = null;
let timer = null;

// How people log in here (`GET /ui/config`), read once.
export async function loginConfig() {
  config ??= await call("GET", "/ui/config");
  return config;
}

function base64url(bytes) {
  return btoa(String.fromCharCode(...new Uint8Array(bytes)))
    .replace(/\+/g, "-")
    .replace(/\//g, "_")
    .replace(/=+$/, "");
}

const random = (n) => base64url(crypto.getRandomValues(new Uint8Array(n)));
const redirectUri = () => new URL("./", location.href).href; // this page's folder: `/ui/`

// To the issuer's login page; it sends the browser back here with a code.
export async function logIn(oidc) {
  const state = random(32);
  const verifier = random(48); // 64 characters, within RFC 7636's 43-128
  const challenge = base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  sessionStorage.setItem(FLOW_KEY, JSON.stringify({ state, verifier }));
  const url = new URL(oidc.authorization_endpoint);
  const query = {
    response_type: "code",
    response_mode: oidc.response_mode,
    client_id: oidc.client_id,
    redirect_uri: redirectUri(),
    scope: oidc.scopes,
    state,
    code_challenge: challenge,
    code_challenge_method: "S256",
  };
  for (const [key, value] of Object.entries(query)) url.searchParams.set(key, value);
  location.assign(url.href);
}

// The issuer's answer, if this load is one: its parameters, and the address bar cleaned of them.
function answer(oidc) {
  const flow = JSON.parse(sessionStorage.getItem(FLOW_KEY) || "null");
  if (!flow) return null;
  const place = oidc.response_mode === "fragment" ? location.hash.slice(1) : location.search.slice(1);
  const params = new URLSearchParams(place);
  if (!params.has("state")) return null;
  sessionStorage.removeItem(FLOW_KEY);
  history.replaceState(null, "", `${location.pathname}#/scans`); // the code leaves the address bar
  return { flow, params };
}

// The token endpoint's answer to a form, or an Error with the issuer's words.
async function tokens(oidc, form) {
  const response = await fetch(oidc.token_endpoint, {
    method: "POST",
    headers: { "Content-Type": "application/x-www-form-urlencoded", Accept: "application/json" },
    body: new URLSearchParams({ client_id: oidc.client_id, ...form }),
    credentials: "omit",
  });
  const body = await response.json().catch(() => null);
  if (!response.ok || !body?.access_token) {
    const refused = new Error(body?.error_description || body?.error || `the issuer answered HTTP ${response.status}`);
    refused.answered = true;
    throw refused;
  }
  return body;
}

function keep(body) {
  token.set(body.access_token);
  const expires_at = Date.now() + 1000 * (Number(body.expires_in) || 300);
  sessionStorage.setItem(REFRESH_KEY, JSON.stringify({ refresh_token: body.refresh_token || "", expires_at }));
}

// Completes a login the issuer sent back here (its code exchanged for this tab's token). Returns
// whether this load was one; throws the reason a login failed.
export async function finishLogin(oidc) {
  const returned = answer(oidc);
  if (!returned) return false;
  const { flow, params } = returned;
  if (params.get("state") !== flow.state) throw new Error("The login answer was not for this tab: log in again.");
  if (params.has("iss") && params.get("iss") !== oidc.issuer) throw new Error("The login answer came from another issuer.");
  if (params.has("error")) throw new Error(params.get("error_description") || params.get("error"));
  keep(
    await tokens(oidc, {
      grant_type: "authorization_code",
      code: params.get("code") || "",
      redirect_uri: redirectUri(),
      code_verifier: flow.verifier,
    }),
  );
  return true;
}

// Keeps this tab's token fresh: renewed with the refresh token while at most min(30 s, half its life)
// remains; `ended(text)` when it cannot be (the session ended at the issuer, no refresh token).
export function keepFresh(oidc, ended) {
  clearTimeout(timer);
  const held = JSON.parse(sessionStorage.getItem(REFRESH_KEY) || "null");
  if (!held || !token.get()) return;
  const left = held.expires_at - Date.now();
  const margin = Math.min(30_000, Math.max(left, 0) / 2);
  timer = setTimeout(async () => {
    if (!held.refresh_token) return ended("Your session ended: log in again.");
    try {
      keep(await tokens(oidc, { grant_type: "refresh_token", refresh_token: held.refresh_token }));
    } catch (error) {
      if (error.answered || Date.now() > held.expires_at) return ended(`Your session ended (${error.message}): log in again.`);
      timer = setTimeout(() => keepFresh(oidc, ended), RETRY_MS); // unreachable for now: again soon
      return;
    }
    keepFresh(oidc, ended);
  }, left - margin);
}

// Forgets the tab's login (the token itself is api.js's). Returns the issuer's logout address, where
// its session ends too (it asks the person to confirm: no token goes into that URL), or "" when this
// tab did not log in there or the issuer has none.
export function forgetLogin(oidc) {
  clearTimeout(timer);
  const held = sessionStorage.getItem(REFRESH_KEY);
  sessionStorage.removeItem(REFRESH_KEY);
  sessionStorage.removeItem(FLOW_KEY);
  if (!held || !oidc?.end_session_endpoint) return "";
  const url = new URL(oidc.end_session_endpoint);
  url.searchParams.set("client_id", oidc.client_id);
  url.searchParams.set("post_logout_redirect_uri", redirectUri());
  return url.href;
}
