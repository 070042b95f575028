"""Cron schedules: cron arithmetic and misfire decisions, schedule storage, firing them."""
