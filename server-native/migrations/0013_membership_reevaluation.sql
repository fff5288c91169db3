-- synchro schema, version 13: a changed membership contract (membership function or one of
-- its dependencies re-registered) re-evaluates every row of the relation, in one worker
-- transaction that diffs edges (never deleting the live edge set), so existing rows follow
-- the new rule. relation_capture records the contract generation last evaluated.

ALTER TABLE synchro.relation_capture ADD COLUMN membership_evaluated bigint NOT NULL DEFAULT 0;
