// The demo's entry: pick the user from ?user=, make that user's client, render the board.
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { createClient } from "@synchro/client";
import { App, UserPicker, USERS } from "./App.jsx";

const user = new URLSearchParams(location.search).get("user");
const root = createRoot(document.getElementById("root"));

if (!USERS.includes(user)) {
  root.render(<UserPicker current={null} />);
} else {
  const client = createClient({
    // The page's own origin: Vite proxies /sync to the synchro server.
    url: "/",
    // One database per user, so alice and bob can share one browser profile.
    name: `board-${user}`,
    // An offline edit of fields the other user did not touch is written again on their
    // change instead of lost to it (the same field edited by both stays a conflict).
    conflicts: "rebase_disjoint",
    // The stand-in auth backend (vite.config.js). The client keeps the token and asks for a
    // new one after the server answered 401 (an expired token).
    token: async () => {
      const r = await fetch(`/demo/token?user=${encodeURIComponent(user)}`);
      if (!r.ok) throw new Error(`the token endpoint answered HTTP ${r.status}`);
      return (await r.json()).token;
    },
    // Come back quickly after a network failure (the default backs off up to 30 s).
    live: { backoffMinMs: 250, backoffMaxMs: 5000 },
  });
  window.synchro = client; // for the devtools console
  root.render(
    <StrictMode>
      <App client={client} user={user} />
    </StrictMode>,
  );
}
