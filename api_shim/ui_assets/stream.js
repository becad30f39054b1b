// A Server-Sent Events stream of this origin, read through fetch so that it carries the tab's token
// (EventSource cannot send one), followed anew after a lost connection, the loss shown until it is back.
import { ApiFailure, headers } from "./api.js";

const FIRST_WAIT_MS = 1000;
const LONGEST_WAIT_MS = 30000;

function fields(block) {
  const found = {};
  for (const line of block.split("\n")) {
    const cut = line.indexOf(":");
    if (cut <= 0) continue; // a comment (keepalive) or a bare name
    const name = line.slice(0, cut);
    found[name] = (found[name] ? `${found[name]}\n` : "") + line.slice(cut + 1).replace(/^ /, "");
  }
  return found;
}

// Calls `onEvent(type, data)` for each message until `end` or the returned stop(); `connection`
// hears `up()`, `lost()` and `failed(error)` (a refusal that following again would not change).
export function follow(path, onEvent, connection) {
  const stop = new AbortController();
  const { signal } = stop;
  (async () => {
    let wait = FIRST_WAIT_MS;
    while (!signal.aborted) {
      try {
        const response = await fetch(path, { headers: headers("text/event-stream"), signal, credentials: "omit" });
        if (!response.ok) throw new ApiFailure(response.status, await response.json().catch(() => null));
        connection.up();
        wait = FIRST_WAIT_MS;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const message = fields(buffer.slice(0, cut));
            buffer = buffer.slice(cut + 2);
            if (message.event === "end") return onEvent("end", null);
            if (message.data !== undefined) onEvent(message.event || "message", JSON.parse(message.data));
          }
        }
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof ApiFailure && error.status < 500 && error.status !== 429) return connection.failed(error);
      }
      if (signal.aborted) return;
      connection.lost();
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, LONGEST_WAIT_MS);
    }
  })();
  return () => stop.abort();
}
