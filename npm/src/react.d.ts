import type { Row, Status, SynchroClient, SynchroError, Value } from "./index.js";

export function useQuery<R = Row>(
  client: SynchroClient<any>,
  sql: string,
  params?: Value[],
): { rows: R[] | undefined; error: SynchroError | null; loading: boolean };

export function useStatus(client: SynchroClient<any>): Status;
