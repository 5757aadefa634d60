"""Zero-touch provisioning: claim credentials operators issue (scoped, expiring, revocable,
usable N times), the exchange by which a device that holds one gets its own broker identity
and the trust root, operator approval, and the broker accounts it creates (Mosquitto's
dynamic security plugin, or the password file). See docs/enrolment.md."""
