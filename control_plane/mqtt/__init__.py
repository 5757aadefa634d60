"""The control plane's MQTT connection: :mod:`.bus` subscribes to what devices publish and
publishes desired states, commands and trust roots, over :mod:`.wire`, a lean MQTT 5 client,
and :mod:`.codec`, its packet encodings. What the rest of the control plane needs to publish is
:mod:`.publisher`'s Protocol. The messages themselves are :mod:`common.protocol`."""
