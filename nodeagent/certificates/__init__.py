"""The node's certificates, as the kubelet keeps them: TLS bootstrap of the client certificate
(``--bootstrap-kubeconfig``), its rotation (``rotateCertificates``), and serving certificates
from the cluster's signer (``serverTLSBootstrap``).

* pem.py: ECDSA P-256 keys, certificate signing requests, certificates read back.
* store.py: the kubelet's files in ``--cert-dir``: ``<prefix>-<timestamp>.pem`` (certificate and
  key together, mode 0600) and the ``<prefix>-current.pem`` symlink, swapped atomically.
* csr.py: a CertificateSigningRequest created in the API and waited for until it is signed.
* manager.py: one certificate kept current, renewed at a jittered 70-90% of its lifetime.
* client.py: the client certificate: bootstrap, the kubeconfig the kubelet writes, and the TLS
  context the API client presents it from (reloaded in place: watches stay open).

The ``cryptography`` package is used rather than the openssl CLI that kubeletserver/certs.py and
controlplane/pki.py call: keys are made in memory and written only together with the
certificate that comes back (the kubelet's order), and validity and names are read from every
certificate the agent loads, at start and at each renewal, without a subprocess per look.
"""
