// Wire values the server expects, made from what the UI has.

/** Now as a canonical datetime: `YYYY-MM-DDTHH:MM:SS.ffffffZ` (always UTC, six digits). */
export function nowDatetime() {
  return new Date().toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
}

/**
 * A decimal typed by the user as canonical decimal text (no '+', exponent, redundant zero
 * or '-0'), or null for an empty field. Throws on anything that is not a plain decimal.
 */
export function canonicalDecimal(text) {
  const s = String(text).trim();
  if (s === "") return null;
  const m = /^([+-]?)(\d*)(?:\.(\d*))?$/.exec(s);
  if (!m || (m[2] === "" && (m[3] ?? "") === "")) throw new Error(`not a decimal: ${s}`);
  const int = m[2].replace(/^0+/, "") || "0";
  const frac = (m[3] ?? "").replace(/0+$/, "");
  const body = frac ? `${int}.${frac}` : int;
  return m[1] === "-" && body !== "0" ? `-${body}` : body;
}

/** A new row key: short, random, sortable by creation time. */
export function newId(prefix) {
  const t = Date.now().toString(36);
  const r = crypto.getRandomValues(new Uint32Array(1))[0].toString(36);
  return `${prefix}-${t}-${r}`;
}

/** A local boolean (SQLite INTEGER 0/1) as a JS boolean. */
export function isTrue(v) {
  return v === 1 || v === true || v === 1n || v === "1";
}

/** A canonical datetime shown as local time. */
export function showTime(ms) {
  if (ms === null || ms === undefined) return "never";
  return new Date(ms).toLocaleTimeString();
}
