// Makes a tool key with jose: an extractable ES256 pair, its JWKs, and the
// RFC 7638 thumbprint jose computes for it.
// in: {}   out: {private_jwk, public_jwk, jkt}
import { generateKeyPair, exportJWK, calculateJwkThumbprint } from 'jose';
import { run } from './io.mjs';

run(async () => {
  const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
  const public_jwk = await exportJWK(publicKey);
  return {
    private_jwk: await exportJWK(privateKey),
    public_jwk,
    jkt: await calculateJwkThumbprint(public_jwk, 'sha256'),
  };
});
