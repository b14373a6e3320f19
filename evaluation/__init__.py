"""`hbmwatch eval` and its scoring: scenarios through the whole path, scored against truth."""
