"""What every checkpoint format shares: keys, paths, table records, stacking
arithmetic and orbax array plumbing. Imports no format's folder."""
