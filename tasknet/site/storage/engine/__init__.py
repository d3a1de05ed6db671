"""The database engine: connections, transactions, group commit, the two drivers,
errors, the schema and its migrations.  Nothing here knows a task."""
