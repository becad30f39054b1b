// The REST interface, same origin, with the bearer token this tab holds (session storage only: it
// never enters a URL, a log or local storage).
const TOKEN_KEY = "skyscan.token";

export class ApiFailure extends Error {
  constructor(status, body) {
    super(body?.message || body?.reason || `HTTP ${status}`);
    this.status = status;
    this.reason = body?.reason || "";
  }
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

// A request's headers: what it accepts, and the tab's token.
export function headers(accept) {
  const found = { Accept: accept };
  const held = token.get();
  if (held) found.Authorization = `Bearer ${held}`;
  return found;
}

export async function call(method, path, body) {
  const sent = headers("application/json");
  if (body !== undefined) sent["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers: sent,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    redirect: "follow",
  });
  const answer = await response.json().catch(() => null);
  if (!response.ok) throw new ApiFailure(response.status, answer);
  return answer;
}

// A one-time login code (the local stack's login link) for this tab's token.
export async function exchange(code) {
  const answer = await call("POST", "/ui/login", { code });
  token.set(answer.token);
}

// Who this tab's token is, and what the service lets it do (`GET /ui/session`): the pages offer only
// the actions it may take. A token that is not a person's is refused there (403).
let who = null;
export const session = {
  async load() {
    who = await call("GET", "/ui/session");
    return who;
  },
  may: (action) => Boolean(who?.may.includes(action)),
  name: () => who?.name ?? "",
  clear() {
    who = null;
  },
};
