"""Monitoring of the devices a trainer runs on (see `device_monitor`)."""
