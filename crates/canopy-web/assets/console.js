// Canopy's operator console: live regions and in-place actions. No dependencies, no build.
// Server-sent events say what changed; the page then fetches itself and swaps each
// [data-live] region (never one holding what the operator is typing). Forms marked
// [data-action] post with the page's CSRF token and show the outcome beside them.
(() => {
  "use strict";
  const csrf = document.querySelector('meta[name="csrf"]')?.content || "";
  const banner = document.getElementById("conn");
  const toast = document.getElementById("toast");
  let timer = null, busy = false, again = false, acting = 0;

  // A region holding what the operator typed (focused or not) is left alone.
  const typing = (region) =>
    Array.from(region.querySelectorAll("input:not([type=hidden]), textarea"))
      .some((el) => el.value !== el.defaultValue);

  async function refresh() {
    // Not while an action is on its way: its form must still be there for its answer.
    if (busy || acting > 0) { again = true; return; }
    busy = true;
    try {
      const r = await fetch(location.href, { headers: { "x-canopy-part": "live" } });
      if (r.status === 401) { location.reload(); return; }
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      // An action started while this page was on its way: its form must stay; read again after.
      if (acting > 0) { again = true; return; }
      document.querySelectorAll("[data-live]").forEach((region) => {
        const fresh = doc.getElementById(region.id);
        if (fresh && fresh.innerHTML !== region.innerHTML && !typing(region)) {
          region.replaceWith(document.importNode(fresh, true));
        }
      });
      document.body.dataset.refreshed = String(Date.now());
    } catch (_) {
      // The feed's state says whether the daemon is there; the next event retries.
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }
  // At most one refresh per 80 ms however fast events come (a busy tree never starves it).
  const soon = () => {
    if (timer === null) timer = setTimeout(() => { timer = null; refresh(); }, 80);
  };

  function follow() {
    const feed = new EventSource("/events");
    feed.onopen = () => { banner.hidden = true; document.body.dataset.live = "open"; };
    feed.onerror = () => {
      banner.hidden = false;
      document.body.dataset.live = "reconnecting";
      // A refused feed (the session ended) is closed for good: reload to the login page.
      if (feed.readyState === EventSource.CLOSED) setTimeout(() => location.reload(), 2000);
    };
    // An issue change (`issue`: number and state) refreshes as a message does: the board's
    // columns and an issue's page are live regions like any other.
    ["message", "activity", "issue", "resync"].forEach((kind) => feed.addEventListener(kind, soon));
    feed.addEventListener("logout", () => location.reload());
  }
  follow();
  // Presence changes without an event (a runner's sync); the tree is re-read now and then.
  setInterval(soon, 10000);

  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!form.matches("form[data-action]")) return;
    event.preventDefault();
    const out = form.querySelector("[data-outcome]") || form.parentElement.querySelector("[data-outcome]");
    const button = form.querySelector("button[type=submit]");
    if (button) button.disabled = true;
    out.textContent = "…";
    acting += 1;
    try {
      const r = await fetch(form.action, {
        method: "POST",
        headers: { "x-canopy-csrf": csrf, "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams(new FormData(form)),
      });
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const answer = doc.getElementById("outcome");
      // Shown beside the form, and in the page's status line, which no refresh replaces.
      toast.replaceChildren(...(answer ? Array.from(answer.childNodes).map((n) => document.importNode(n, true)) : []));
      out.replaceChildren(...(answer ? Array.from(answer.childNodes).map((n) => document.importNode(n, true))
                                      : [document.createTextNode("failed: HTTP " + r.status)]));
      out.dataset.status = String(r.status);
      if (r.ok) {
        // What was typed is sent: the form is clean again, so live refreshes resume.
        form.reset();
        const key = form.querySelector('input[name="idempotency_key"]');
        if (key) key.value = Math.random().toString(16).slice(2) + Date.now().toString(16);
      }
    } catch (e) {
      out.textContent = "the console did not answer: " + e;
    } finally {
      acting -= 1;
      if (button) button.disabled = false;
      soon();
    }
  });
})();
