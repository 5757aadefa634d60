"""Config twins: desired settings and application keys per device or label group, signed
for each device and compared with what it reports (:mod:`.documents`)."""
