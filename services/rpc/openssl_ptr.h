// Owning pointers for the libcrypto objects the security code uses (pki.cc,
// tls.cc): each frees its object with the matching *_free call.
#ifndef STAGEWISE_SERVICES_RPC_OPENSSL_PTR_H_
#define STAGEWISE_SERVICES_RPC_OPENSSL_PTR_H_

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

namespace stagewise::rpc::openssl {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};

// BIO_free returns int: wrapped so it fits the deleter's signature.
inline void FreeBio(BIO* bio) { BIO_free(bio); }
// Frees the stack only: its certificates are owned elsewhere.
inline void FreeX509Stack(STACK_OF(X509) * stack) { sk_X509_free(stack); }

using BioPtr = std::unique_ptr<BIO, Deleter<BIO, FreeBio>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using ExtensionPtr = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;
using GeneralNamePtr = std::unique_ptr<GENERAL_NAME, Deleter<GENERAL_NAME, GENERAL_NAME_free>>;
using GeneralNamesPtr = std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES, GENERAL_NAMES_free>>;
using BignumPtr = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;
using StorePtr = std::unique_ptr<X509_STORE, Deleter<X509_STORE, X509_STORE_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;
using X509StackPtr = std::unique_ptr<STACK_OF(X509), Deleter<STACK_OF(X509), FreeX509Stack>>;

}  // namespace stagewise::rpc::openssl

#endif  // STAGEWISE_SERVICES_RPC_OPENSSL_PTR_H_
