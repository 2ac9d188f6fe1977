-- The precondition fingerprint a firing was started on (issue 18 review):
-- it becomes the job's only when the firing ends done, so a change is not
-- used up by a firing that was refused, missed or interrupted.
ALTER TABLE schedule_firings ADD COLUMN precondition_state text;
