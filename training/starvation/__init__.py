"""Gradient Starvation (Pezeshki et al. 2021): two moons, Colored MNIST, SD on erased data (tasks gs_*)."""
