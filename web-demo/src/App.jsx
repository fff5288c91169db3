// The task board: a status bar, projects, the selected project's tasks, and the writes the
// server did not apply. Every read is a live query over the local SQLite database
// (`useQuery` re-renders when a write, local or from the server, changes its result); every
// write goes to the local database at once and is queued for the server.
import { useCallback, useEffect, useMemo, useState } from "react";
import { useQuery, useStatus } from "@synchro/client/react";
import { canonicalDecimal, isTrue, newId, nowDatetime, showTime } from "./values.js";

export const USERS = ["alice", "bob"];

/** A title quoted for a one-line summary. */
const q = (t) => `"${t.length > 60 ? `${t.slice(0, 57)}…` : t}"`;

/** Links to the board as each user (one database per user: `board-<user>`). */
export function UserPicker({ current }) {
  return (
    <nav className="users" data-testid="user-picker">
      <span>Signed in as</span>
      {USERS.map((u) => (
        <a key={u} href={`?user=${u}`} data-testid={`user-${u}`} className={u === current ? "current" : ""} aria-current={u === current ? "page" : undefined}>
          {u}
        </a>
      ))}
      {current === null && <span data-testid="pick-user">pick a user to open their board</span>}
    </nav>
  );
}

// What the app wrote, by mutation ID, so the issues panel can say what a refused write was
// (the queue knows table and field IDs, not what the user did). Kept per user.
function useWriteLog(user) {
  const key = `board-${user}:writes`;
  const [log, setLog] = useState(() => {
    try {
      return JSON.parse(localStorage.getItem(key)) || {};
    } catch {
      return {};
    }
  });
  const remember = useCallback(
    (mutationId, summary) =>
      setLog((l) => {
        const next = { ...l, [mutationId]: summary };
        try {
          localStorage.setItem(key, JSON.stringify(next));
        } catch {}
        return next;
      }),
    [key],
  );
  return [log, remember];
}

// Conflicts and rejected writes: those already in the queue when the page opened
// (mutations()), then each one as the server answers (onConflict / onRejected).
function useIssues(client) {
  const [issues, setIssues] = useState([]);
  useEffect(() => {
    let active = true;
    const add = (m) =>
      active &&
      setIssues((list) => (list.some((x) => x.mutationId === m.mutationId) ? list.map((x) => (x.mutationId === m.mutationId ? m : x)) : [...list, m]));
    const stopConflicts = client.onConflict(add);
    const stopRejected = client.onRejected(add);
    client.mutations().then(
      (all) => all.filter((m) => m.state === "conflict" || m.state === "rejected_terminal").forEach(add),
      () => {},
    );
    return () => {
      active = false;
      stopConflicts();
      stopRejected();
    };
  }, [client]);
  return issues;
}

function connection(status) {
  if (status.connected) return "connected";
  if (status.offline) return "offline";
  if (status.phase === "upgrade_required") return "stopped: upgrade required";
  // Something the configuration must change (a refused origin or token): say what.
  if (status.phase === "error" && status.lastError) return `error: ${status.lastError.message || status.lastError.code}`;
  return status.phase;
}

function StatusBar({ status }) {
  const p = status.progress;
  return (
    <section className={`status ${status.phase}`} data-testid="status-bar">
      <span>
        phase <b data-testid="status-phase">{status.phase}</b>
      </span>
      <span data-testid="status-connection" className={status.connected ? "ok" : "warn"}>
        {connection(status)}
      </span>
      <span>
        sync <b data-testid="status-progress">{p ? `${p.phase}: ${p.rows}${p.totalRows != null ? ` of ${p.totalRows}` : ""} rows` : "idle"}</b>
      </span>
      <span>
        last synced <b data-testid="status-last-synced">{showTime(status.lastSyncedAt)}</b>
      </span>
      <span>
        pending writes <b data-testid="status-pending">{status.pendingWrites}</b>
      </span>
      <span>
        last error <b data-testid="status-error">{status.lastError ? status.lastError.code : "none"}</b>
      </span>
      <span>
        schema <b data-testid="status-schema">v{status.schema.version}</b>
      </span>
      <span className="dim" title="the tab holding the database; other tabs of the same user reach it through this one">
        {status.leader ? "this tab holds the database" : "through another tab"}
      </span>
    </section>
  );
}

function UpgradeBanner({ client, status }) {
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  if (status.phase !== "upgrade_required") return null;
  const reset = async () => {
    setBusy(true);
    setError(null);
    try {
      await client.requestSchemaReset();
    } catch (e) {
      setError(`${e.code}: ${e.message}`);
    } finally {
      setBusy(false);
    }
  };
  return (
    <section className="banner" data-testid="upgrade-banner" role="alert">
      <b>Upgrade required</b> ({status.upgrade?.reason}):{" "}
      <span data-testid="upgrade-action">{status.upgrade?.action}</span>
      {status.upgrade?.reason !== "client_runtime" && (
        <button data-testid="upgrade-reset" onClick={reset} disabled={busy}>
          Install the new schema and rebuild
        </button>
      )}
      {error && <span className="error" data-testid="upgrade-error">{error}</span>}
    </section>
  );
}

function Projects({ client, selected, onSelect, write }) {
  const { rows, error } = useQuery(
    client,
    `SELECT p.id, p.name, p.budget,
            (SELECT count(*) FROM tasks t WHERE t.project_id = p.id AND t.done = 0) AS open
       FROM projects p ORDER BY p.name, p.id`,
  );
  const [name, setName] = useState("");
  const [budget, setBudget] = useState("");
  const add = async (e) => {
    e.preventDefault();
    if (!name.trim()) return;
    let amount;
    try {
      amount = canonicalDecimal(budget);
    } catch (err) {
      write.fail(err);
      return;
    }
    const id = newId("p");
    const values = { name: name.trim(), archived: false, updated_at: nowDatetime() };
    if (amount !== null) values.budget = amount;
    if (await write.run("insert", "projects", id, values, `add project ${q(values.name)}`)) {
      setName("");
      setBudget("");
      onSelect(id);
    }
  };
  return (
    <section className="projects" data-testid="projects">
      <h2>Projects</h2>
      {error && <p className="error">{error.code}: {error.message}</p>}
      <ul>
        {(rows || []).map((p) => (
          <li key={p.id}>
            <button data-testid="project" data-id={p.id} className={p.id === selected ? "selected" : ""} onClick={() => onSelect(p.id)}>
              <span data-testid="project-name">{p.name}</span>
              <span className="dim">
                {" "}
                {String(p.open)} open{p.budget !== null ? ` · budget ${p.budget}` : ""}
              </span>
            </button>
          </li>
        ))}
        {rows && rows.length === 0 && <li className="dim">No projects yet.</li>}
      </ul>
      <form onSubmit={add}>
        <input data-testid="new-project-name" placeholder="New project" value={name} onChange={(e) => setName(e.target.value)} />
        <input data-testid="new-project-budget" placeholder="Budget" inputMode="decimal" size={8} value={budget} onChange={(e) => setBudget(e.target.value)} />
        <button data-testid="add-project">Add</button>
      </form>
    </section>
  );
}

function TaskRow({ task, write }) {
  const [editing, setEditing] = useState(false);
  const [title, setTitle] = useState(task.title);
  const done = isTrue(task.done);
  const save = async (e) => {
    e.preventDefault();
    setEditing(false);
    if (title !== task.title) await write.run("update", "tasks", task.id, { title, updated_at: nowDatetime() }, `rename ${q(task.title)} to ${q(title)}`);
  };
  return (
    <li data-testid="task" data-id={task.id} data-done={String(done)} className={done ? "done" : ""}>
      <input
        type="checkbox"
        data-testid="task-done"
        checked={done}
        onChange={() => write.run("update", "tasks", task.id, { done: !done, updated_at: nowDatetime() }, `mark ${q(task.title)} ${done ? "not done" : "done"}`)}
      />
      {editing ? (
        <form onSubmit={save} className="rename">
          <input data-testid="task-rename-input" autoFocus value={title} onChange={(e) => setTitle(e.target.value)} />
          <button data-testid="task-rename-save">Save</button>
          <button type="button" onClick={() => setEditing(false)}>
            Cancel
          </button>
        </form>
      ) : (
        <span data-testid="task-title" className="title">
          {task.title}
        </span>
      )}
      {!editing && (
        <button
          data-testid="task-rename"
          onClick={() => {
            setTitle(task.title);
            setEditing(true);
          }}
        >
          Rename
        </button>
      )}
      <button data-testid="task-delete" onClick={() => write.run("delete", "tasks", task.id, null, `delete ${q(task.title)}`)}>
        Delete
      </button>
    </li>
  );
}

function Tasks({ client, projectId, write }) {
  const { rows, error, loading } = useQuery(
    client,
    "SELECT id, title, done, position, updated_at FROM tasks WHERE project_id = ? ORDER BY position, id",
    [projectId],
  );
  const [title, setTitle] = useState("");
  const add = async (e) => {
    e.preventDefault();
    if (!title.trim()) return;
    const position = (rows || []).reduce((m, t) => Math.max(m, Number(t.position) + 1), 0);
    const values = { project_id: projectId, title: title.trim(), done: false, position, updated_at: nowDatetime() };
    if (await write.run("insert", "tasks", newId("t"), values, `add task ${q(values.title)}`)) setTitle("");
  };
  return (
    <section className="tasks" data-testid="tasks">
      <h2>Tasks</h2>
      {error && <p className="error">{error.code}: {error.message}</p>}
      <form onSubmit={add}>
        <input data-testid="new-task-title" placeholder="New task" value={title} onChange={(e) => setTitle(e.target.value)} />
        <button data-testid="add-task">Add task</button>
      </form>
      {loading && !rows ? (
        <p className="dim">Loading…</p>
      ) : (
        <ul>
          {(rows || []).map((t) => (
            <TaskRow key={t.id} task={t} write={write} />
          ))}
          {rows && rows.length === 0 && <li className="dim">No tasks.</li>}
        </ul>
      )}
    </section>
  );
}

function Issues({ client, log }) {
  const issues = useIssues(client);
  const { rows } = useQuery(client, "SELECT id, title FROM tasks");
  const titles = useMemo(() => new Map((rows || []).map((t) => [t.id, t.title])), [rows]);
  return (
    <section className="issues" data-testid="issues-panel">
      <h2>Conflicts and rejected writes</h2>
      <p className="dim">
        A conflict: the row changed on the server since this database last saw it, so the write was not applied and the row shows the
        server's version. A rejection: the server refused the write for good (here, a constraint).
      </p>
      {issues.length === 0 ? (
        <p data-testid="issues-empty">None.</p>
      ) : (
        <ul>
          {issues.map((m) => {
            const code = m.state === "conflict" ? "conflict" : m.outcome?.code || "rejected";
            const now = titles.get(m.pk);
            return (
              <li key={m.mutationId} data-testid="issue" data-state={m.state} data-code={code} data-key={String(m.pk)}>
                {m.state === "conflict" ? <b>Conflict</b> : <><b>Rejected</b> <code>{code}</code></>}: {log[m.mutationId] || `${m.operation} of ${String(m.pk)}`}
                {m.outcome?.message && <span className="dim"> ({m.outcome.message})</span>}
                {now !== undefined && (
                  <span>
                    {" "}
                    — the task is now <q data-testid="issue-now">{now}</q>
                  </span>
                )}
              </li>
            );
          })}
        </ul>
      )}
    </section>
  );
}

export function App({ client, user }) {
  const status = useStatus(client);
  const [log, remember] = useWriteLog(user);
  const [actionError, setActionError] = useState(null);
  const [selected, setSelected] = useState(null);
  const { rows: projects } = useQuery(client, "SELECT id FROM projects ORDER BY name, id");
  const projectId = selected && projects?.some((p) => p.id === selected) ? selected : (projects?.[0]?.id ?? null);

  // Every write: queued locally (resolves once durable), remembered for the issues panel.
  const write = useMemo(
    () => ({
      async run(op, table, key, values, summary) {
        try {
          const id = op === "delete" ? await client.delete(table, key) : await client[op](table, key, values);
          remember(id, summary);
          setActionError(null);
          return true;
        } catch (e) {
          setActionError(`${e.code || "error"}: ${e.message}`);
          return false;
        }
      },
      fail(e) {
        setActionError(e.message);
      },
    }),
    [client, remember],
  );

  return (
    <div className="app">
      <header>
        <h1>Task board</h1>
        <UserPicker current={user} />
      </header>
      <StatusBar status={status} />
      <UpgradeBanner client={client} status={status} />
      {actionError && (
        <p className="error" data-testid="action-error">
          {actionError}
        </p>
      )}
      <main>
        <Projects client={client} selected={projectId} onSelect={setSelected} write={write} />
        {projectId ? <Tasks client={client} projectId={projectId} write={write} /> : <section className="tasks dim">Add a project to start.</section>}
        <Issues client={client} log={log} />
      </main>
    </div>
  );
}
