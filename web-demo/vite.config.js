// The demo's Vite config.
//
// - /sync goes to the synchro server (SYNCHRO_URL, default the `synchro-server dev` address)
//   through Vite's proxy, in `vite` (dev) and `vite preview` alike: the server sends no CORS
//   headers, so the page and the server must share an origin.
// - GET /demo/token?user=alice|bob mints a short-lived HS256 JWT (the dev server's secret,
//   or SYNCHRO_JWT_SECRET). It stands in for the app's own auth backend: a real app gets its
//   tokens from wherever its users log in, never from a secret shipped to the browser.
import { createHmac } from "node:crypto";
import { fileURLToPath } from "node:url";
import path from "node:path";
import fs from "node:fs";
import { defineConfig, searchForWorkspaceRoot } from "vite";

const SYNCHRO_URL = process.env.SYNCHRO_URL || "http://127.0.0.1:8787";
const SECRET = process.env.SYNCHRO_JWT_SECRET || "synchro-dev-secret-not-for-production";
const USERS = new Set(["alice", "bob"]);
const TOKEN_TTL_SECS = 15 * 60;

const b64url = (v) => Buffer.from(typeof v === "string" ? v : JSON.stringify(v)).toString("base64url");

/** An HS256 JWT `{sub, exp}` for `user`, as the synchro server verifies it. */
export function mintToken(user, secret = SECRET, ttl = TOKEN_TTL_SECS) {
  const head = `${b64url({ alg: "HS256", typ: "JWT" })}.${b64url({ sub: user, exp: Math.floor(Date.now() / 1000) + ttl })}`;
  return `${head}.${createHmac("sha256", secret).update(head).digest("base64url")}`;
}

function tokenEndpoint(req, res, next) {
  const url = new URL(req.url, "http://localhost");
  if (url.pathname !== "/demo/token") return next();
  const user = url.searchParams.get("user");
  res.setHeader("cache-control", "no-store");
  res.setHeader("content-type", "application/json");
  if (req.method !== "GET" || !USERS.has(user)) {
    res.statusCode = 400;
    res.end(JSON.stringify({ error: "GET /demo/token?user=alice|bob" }));
    return;
  }
  res.end(JSON.stringify({ token: mintToken(user), expiresIn: TOKEN_TTL_SECS }));
}

/** The stand-in auth backend, in both `vite` and `vite preview`. */
function demoAuth() {
  return {
    name: "synchro-demo-auth",
    configureServer(server) {
      server.middlewares.use(tokenEndpoint);
    },
    configurePreviewServer(server) {
      server.middlewares.use(tokenEndpoint);
    },
  };
}

const proxy = { "/sync": { target: SYNCHRO_URL, changeOrigin: true } };

// `@synchro/client` is `file:../npm`, which npm links: the package's files (its worker and
// wasm) live outside this folder, so the dev server must be allowed to serve them (else
// "outside of Vite serving allow list" and the client's status is `error`).
const here = path.dirname(fileURLToPath(import.meta.url));
let linked;
try {
  linked = fs.realpathSync(path.join(here, "node_modules/@synchro/client"));
} catch {
  linked = path.resolve(here, "../npm"); // not installed yet: where file:../npm points
}

export default defineConfig({
  plugins: [demoAuth()],
  // Plain JSX (no React plugin, so no fast refresh): the automatic runtime.
  oxc: { jsx: { runtime: "automatic", importSource: "react" } },
  resolve: {
    // The linked package's own node_modules holds a React for its tests; the app and the
    // hooks of @synchro/client/react must share this app's one copy.
    dedupe: ["react", "react-dom"],
  },
  // No optimizeDeps.exclude is needed for @synchro/client: Vite 8's dep optimizer rewrites
  // the package's `new Worker(new URL("./worker.js", import.meta.url))` to the package's own
  // file (checked in dev mode with this linked package and with the packed tarball).
  server: {
    proxy,
    fs: { allow: [searchForWorkspaceRoot(process.cwd()), linked] },
  },
  preview: { proxy },
  build: { target: "es2022" },
});
