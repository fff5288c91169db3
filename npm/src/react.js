// @synchro/client/react: hooks over a client made with createClient. React is an optional
// peer dependency; nothing here runs unless the app imports this subpath.
import { useEffect, useState, useSyncExternalStore } from "react";

function keyOf(sql, params) {
  return JSON.stringify([sql, params ?? []], (_, v) => (typeof v === "bigint" ? `${v}n` : v));
}

/**
 * The rows of a live query: `{ rows, error, loading }`. Re-renders only when the result
 * differs (the client's watch delivers only changed results). StrictMode-safe: the watch is
 * started by an effect and stopped by its cleanup.
 */
export function useQuery(client, sql, params) {
  const key = keyOf(sql, params);
  const [state, setState] = useState({ key, rows: undefined, error: null, loading: true });
  useEffect(() => {
    let active = true;
    const stop = client.watch(
      sql,
      params ?? [],
      (rows) => active && setState({ key, rows, error: null, loading: false }),
      (error) => active && setState((s) => ({ ...s, key, error, loading: false })),
    );
    return () => {
      active = false;
      stop();
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [client, key]);
  // A changed query shows as loading until its first result (never the old query's rows).
  if (state.key !== key) return { rows: undefined, error: null, loading: true };
  return { rows: state.rows, error: state.error, loading: state.loading };
}

/** The client's status, re-rendering on every change. */
export function useStatus(client) {
  return useSyncExternalStore(
    (onChange) => client.onStatus(onChange),
    () => client.status,
  );
}
