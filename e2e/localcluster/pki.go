package main

// The pki part writes everything a loopback-only cluster needs to speak real
// TLS: a CA, the API server's serving certificate (for 127.0.0.1 and the
// in-cluster service IP), an admin client certificate in the system:masters
// group, the service-account signing key pair, and an admin kubeconfig.
//
// Usage: localcluster pki --dir DIR [--server https://127.0.0.1:PORT] [--service-ip 10.0.0.1]
//
// Files are only created when missing, so a second call keeps the existing
// cluster's identity (a running cluster can be reused).

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity is long enough for any test run and short enough that a stale
// folder is noticed eventually.
const certValidity = 365 * 24 * time.Hour

func runPKI(args []string) int {
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	dir := fs.String("dir", "", "folder to write the files into (required)")
	server := fs.String("server", "https://127.0.0.1:6443", "API server URL written into the kubeconfig")
	serviceIP := fs.String("service-ip", "10.0.0.1", "first IP of the service CIDR (the kubernetes Service)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "pki: --dir is required")
		return 2
	}
	if err := writePKI(*dir, *server, *serviceIP); err != nil {
		fmt.Fprintf(os.Stderr, "pki: %v\n", err)
		return 1
	}
	return 0
}

func writePKI(dir, server, serviceIP string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	svcIP := net.ParseIP(serviceIP)
	if svcIP == nil {
		return fmt.Errorf("--service-ip %q is not an IP address", serviceIP)
	}
	caKey, caCert, err := loadOrCreateCA(dir)
	if err != nil {
		return err
	}
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), svcIP},
	}
	if err := ensureSigned(dir, "apiserver", serving, caKey, caCert); err != nil {
		return err
	}
	admin := &x509.Certificate{
		// system:masters is bound to cluster-admin by the bootstrap policy.
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := ensureSigned(dir, "admin", admin, caKey, caCert); err != nil {
		return err
	}
	saKey, err := loadOrCreateKey(filepath.Join(dir, "sa.key"))
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub); err != nil {
		return err
	}
	return writeKubeconfig(dir, server)
}

func loadOrCreateKey(path string) (*rsa.PrivateKey, error) {
	if b, err := os.ReadFile(path); err == nil {
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("%s: not PEM", path)
		}
		return x509.ParsePKCS1PrivateKey(blk.Bytes)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return key, writePEM(path, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
}

func loadOrCreateCA(dir string) (*rsa.PrivateKey, *x509.Certificate, error) {
	key, err := loadOrCreateKey(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, nil, err
	}
	certPath := filepath.Join(dir, "ca.crt")
	if b, err := os.ReadFile(certPath); err == nil {
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, nil, fmt.Errorf("%s: not PEM", certPath)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		return key, c, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "elastic-jax-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return key, c, err
}

// ensureSigned writes NAME.key and NAME.crt signed by the CA unless both exist.
func ensureSigned(dir, name string, tmpl *x509.Certificate, caKey *rsa.PrivateKey, caCert *x509.Certificate) error {
	certPath := filepath.Join(dir, name+".crt")
	if _, err := os.Stat(certPath); err == nil {
		return nil
	}
	key, err := loadOrCreateKey(filepath.Join(dir, name+".key"))
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(certValidity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePEM(certPath, "CERTIFICATE", der)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeKubeconfig(dir, server string) error {
	enc := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		return base64.StdEncoding.EncodeToString(b), err
	}
	ca, err := enc("ca.crt")
	if err != nil {
		return err
	}
	crt, err := enc("admin.crt")
	if err != nil {
		return err
	}
	key, err := enc("admin.key")
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: local
  context:
    cluster: local
    user: admin
current-context: local
`, server, ca, crt, key)
	return os.WriteFile(filepath.Join(dir, "admin.kubeconfig"), []byte(cfg), 0o600)
}
