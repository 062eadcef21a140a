"""What the workspace is made of: cards, pins, projects, records, results, where things live."""
