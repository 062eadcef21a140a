"""How ranks start, on which devices and nodes, and leave nothing behind."""
