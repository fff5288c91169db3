// The app is served by `vite preview`; /sync and /seeds go to the synchro server, so the page and
// the server share an origin (no CORS). Nothing here configures @synchro/client.
export default {
  preview: {
    proxy: {
      "/sync": { target: process.env.SYNCHRO_URL, changeOrigin: true },
      "/seeds": { target: process.env.SYNCHRO_URL, changeOrigin: true },
    },
  },
};
