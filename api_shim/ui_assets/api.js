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

export async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  const held = token.get();
  if (held) headers.Authorization = `Bearer ${held}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
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
