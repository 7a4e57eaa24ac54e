//go:build tools

// Package traefik pins Traefik, the cluster's ingress: its Knative provider
// serves Knative's KIngresses and its Gateway API provider the overlay's
// HTTPRoutes. Never compiled: scripts/cluster builds cmd/traefik.
package traefik

import _ "github.com/traefik/traefik/v3/cmd/traefik"
