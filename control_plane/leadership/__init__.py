"""Which control plane replica leads the singleton loops, by a lease in the database, with a
fencing epoch on every write those loops make."""
