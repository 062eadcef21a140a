"""What is known of a host-sync site across commands: below hunt, census, scan and history."""
