"""`hbmwatch bench`: speed and memory of the real paths, each beside a baseline."""
