"""Launchers: jobs, bundlers and cloud runners (`axlearn gcp ...`)."""
