"""The commands: one module each, `main(argv) -> int`, importing no other command."""
