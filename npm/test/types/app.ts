import { createClient } from "@synchro/client";
import type { Schema, TasksRow } from "./synchro";

const db = createClient<Schema>({ url: "/", token: () => "t" });
await db.insert("tasks", "t1", { project_id: "p1", title: "x", done: false, position: 0, updated_at: "2026-12-06T00:00:00.000000Z" });
await db.update("tasks", "t1", { done: true });
// The natural forms: 0/1 for a boolean (what a read gives), a Date for a datetime, a number for an int64.
await db.update("tasks", "t1", { done: 1, updated_at: new Date() });
await db.delete("notes", 5);
await db.update("notes", 5n, { body: null, meta: { a: [1, "b"] } });
await db.delete("projects", "p1");
const rows = await db.query<TasksRow>("SELECT * FROM tasks");
const done: 0 | 1 = rows[0].done;
// @ts-expect-error a missing required field
await db.insert("tasks", "t2", { project_id: "p1", done: false, position: 0, updated_at: "x" });
// @ts-expect-error a wrong value type
await db.update("tasks", "t1", { done: "yes" });
// @ts-expect-error a number other than 0 or 1 for a boolean
await db.update("tasks", "t1", { done: 2 });
// @ts-expect-error a column that does not exist
await db.update("tasks", "t1", { colour: "red" });
// @ts-expect-error a table that does not exist
await db.delete("task", "t1");
// @ts-expect-error an int64 key as a boolean
await db.delete("notes", true);
// @ts-expect-error a non-writable field (the key)
await db.update("projects", "p1", { id: "p2" });
const untyped = createClient({ url: "/", token: () => "t" });
await untyped.insert("anything", 1, { whatever: "ok" });
export { done };
