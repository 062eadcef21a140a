"""Runs that measure a case: its reproducer, its red/green proof, a site judged on a release."""
