package main

// TLS scenarios. Knative mounts the queue-proxy's certificate at a fixed
// path, /var/lib/knative/certs, which Knative's Go queue-proxy cannot be
// told to read elsewhere. So a TLS scenario's run mounts a tmpfs over
// /var/lib in a mount namespace of its own (private, so nothing reaches
// the machine's mounts) and writes there the pair the runner made for
// this run: both proxies read the same files from the same path, and the
// machine's real path is never touched.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// knativeCertDir is where Knative mounts the queue-proxy's certificate
// (knative.dev/serving/pkg/queue.CertDirectory).
const knativeCertDir = "/var/lib/knative/certs"

// serverName is the name the activator verifies a pod's certificate
// against (knative.dev/networking/pkg/certificates.LegacyFakeDnsName).
const serverName = "data-plane.knative.dev"

// trusted is the CA the TLS client trusts, set in a run that has one.
var trusted *x509.CertPool

// makeCerts writes a CA (ca.pem) and a pair it signed for the names
// Knative's certificates carry (tls.crt, tls.key) into dir.
func makeCerts(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "conformance CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: serverName},
		DNSNames:     []string{serverName, "kn-user-default"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	for name, block := range map[string]*pem.Block{
		"ca.pem":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: leafDER},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// mountCerts, in a run's own mount namespace, puts the pair of dir where
// Knative mounts it, and trusts dir's CA.
func mountCerts(dir string) error {
	// Mounts made here stay here.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := syscall.Mount("tmpfs", "/var/lib", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("a tmpfs over /var/lib: %w", err)
	}
	if err := os.MkdirAll(knativeCertDir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(knativeCertDir, name), b, 0o600); err != nil {
			return err
		}
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return err
	}
	trusted = x509.NewCertPool()
	if !trusted.AppendCertsFromPEM(ca) {
		return fmt.Errorf("%s: no certificate", filepath.Join(dir, "ca.pem"))
	}
	return nil
}

var tlsVersions = map[string]uint16{"1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13}

// handshake speaks TLS on conn as c asks, and records in e what came of
// it: tls.version, tls.alpn, tls.group (the key exchange), tls.cipher
// (for TLS 1.2, where the server picks among suites the client offered),
// or tls.error. It returns the TLS connection, nil when the handshake
// failed.
func handshake(conn net.Conn, c *TLSClient, e exchange) net.Conn {
	config := &tls.Config{
		ServerName: serverName,
		RootCAs:    trusted,
		NextProtos: c.ALPN,
		MinVersion: tlsVersions[c.Min],
		MaxVersion: tlsVersions[c.Max],
	}
	tc := tls.Client(conn, config)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		e["tls.error"] = tlsErrClass(err)
		return nil
	}
	state := tc.ConnectionState()
	e["tls.version"] = tls.VersionName(state.Version)
	e["tls.alpn"] = state.NegotiatedProtocol
	if state.NegotiatedProtocol == "" {
		e["tls.alpn"] = "(none)"
	}
	e["tls.group"] = state.CurveID.String()
	if state.Version == tls.VersionTLS12 {
		e["tls.cipher"] = tls.CipherSuiteName(state.CipherSuite)
	}
	return tc
}

// tlsErrClass names a failed handshake as the client sees it: the alert
// the server sent, or what happened to the connection.
func tlsErrClass(err error) string {
	var alert tls.AlertError
	if errors.As(err, &alert) {
		return "client alert: " + alert.Error()
	}
	msg := err.Error()
	if i := strings.Index(msg, "remote error: "); i >= 0 {
		return "alert: " + msg[i+len("remote error: "):]
	}
	return errClass(err)
}
