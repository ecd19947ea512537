"""Container images for jobs: the shared ``job.image`` field and its options.

``job.image`` is read through the seam by every backend: VM providers run each node's launcher inside one
container (see runtime code in this package), Kubernetes uses it as the pod's image, Slurm hands it to
pyxis/enroot/apptainer. This module holds only the spec models, so importing the spec stays cheap.
"""
