-- A record a transform filtered out is claimed too, marked filtered: the audit counts it as filtered, not lost.
--
-- Under exactly-once, a batch's claims, rows and offsets commit in one transaction; a record its table's
-- transform returned None for leaves no row, so until now nothing said it had been read on purpose, and the
-- audit counted it lost. Its claim (filtered = true) is written in that same transaction, so a kill can never
-- move an offset past a filtered record without it; it lives and expires with the table's other claims (its
-- window), and `kdg db forget` drops it with them. NULL: an ordinary claim (a row was written).
ALTER TABLE kdg_dedup ADD COLUMN filtered boolean;
