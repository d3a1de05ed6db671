"""The database engine: targets, the two drivers, SQL rendered once per
engine, transactions, group commit, the pool, errors, timestamps, the schema
and its migrations.  Nothing here knows a task (the layout:
:mod:`tasknet.site.storage.engine.database`)."""
