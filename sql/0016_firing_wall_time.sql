-- The wall time a firing was offered with (its job's own, else its agent's
-- core budget then): the sweep that interrupts an overrunning firing uses
-- it, so a reload lowering the agent's budget does not interrupt a firing
-- that still runs within the time it was given. NULL for firings offered
-- before this column existed (the sweep then falls back as before).
ALTER TABLE schedule_firings ADD COLUMN wall_s double precision;
