"""Google Cloud: config files, instance types, JobSet builder, runners and bundlers."""
