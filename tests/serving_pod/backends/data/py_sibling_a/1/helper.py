"""A helper module beside model.py; each sibling model has its own."""
WHO = "a"
